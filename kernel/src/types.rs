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
                "character {c:?} at position {i} of {:?} is not allowed (use A-Z a-z 0-9 . _ - :)",
                shown(&name)
            )));
        }
        if name.starts_with(['.', '-']) {
            return Err(bad(format!(
                "{:?} must not start with '.' or '-'",
                shown(&name)
            )));
        }
        Ok(Self(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The prefix reserved for temporary queues: `tmp.<node>.<connection>.<n>`.
    pub const TEMPORARY_PREFIX: &'static str = "tmp.";
    /// The suffix of a queue's default dead-letter (and expiry) queue: `<queue>.DLQ`.
    pub const DEAD_LETTER_SUFFIX: &'static str = ".DLQ";

    /// The name of a connection's `seq`-th temporary queue, on `node`.
    pub fn temporary(
        node: &NodeId,
        connection: impl fmt::Display,
        seq: u64,
    ) -> Result<Self, KernelError> {
        Self::new(format!(
            "{}{node}.{connection}.{seq}",
            Self::TEMPORARY_PREFIX
        ))
    }

    /// Whether the name is in the space reserved for temporary queues (`tmp.`).
    pub fn is_temporary(&self) -> bool {
        self.0.starts_with(Self::TEMPORARY_PREFIX)
    }

    /// The node a temporary queue lives on, as its name says; `None` for any other queue.
    pub fn temporary_node(&self) -> Option<&str> {
        self.0
            .strip_prefix(Self::TEMPORARY_PREFIX)
            .and_then(|rest| rest.split('.').next())
    }

    /// Whether the name is that of a default dead-letter queue (`<queue>.DLQ`).
    pub fn is_dead_letter_queue(&self) -> bool {
        self.0.ends_with(Self::DEAD_LETTER_SUFFIX)
    }

    /// This queue's default dead-letter (and expiry) queue, `<queue>.DLQ`; `None` if that name
    /// would be longer than [`QueueName::LEN_MAX`].
    pub fn dead_letter_queue(&self) -> Option<QueueName> {
        QueueName::new(format!("{}{}", self.0, Self::DEAD_LETTER_SUFFIX)).ok()
    }

    /// The queue whose default dead-letter queue this is (`orders` for `orders.DLQ`); `None` if
    /// this is not named like one.
    pub fn dead_letter_source(&self) -> Option<QueueName> {
        self.0
            .strip_suffix(Self::DEAD_LETTER_SUFFIX)
            .and_then(|base| QueueName::new(base).ok())
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

/// A queue's placement epoch: the fencing token of its placement. It grows each time the queue
/// changes owner, and a back-end refuses a call routed by any epoch other than the one it owns
/// the queue at. On the wire (`placement_epoch` fields, the metadata codec) it is a bare `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PlacementEpoch(u64);

impl PlacementEpoch {
    /// The epoch of a queue placed by a rule, not by an entry (a temporary queue, a queue with
    /// no placement entry): not known, so a back-end does not check it.
    pub const UNKNOWN: Self = Self(0);
    /// The epoch of a queue placed by hand (static configuration, tests and tools); the
    /// metadata group's placements carry epochs of their own.
    pub const STATIC: Self = Self(1);

    /// The epoch a wire value names (0: [`PlacementEpoch::UNKNOWN`]).
    pub const fn new(epoch: u64) -> Self {
        Self(epoch)
    }

    /// The wire value.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Whether this names an epoch at all (not [`PlacementEpoch::UNKNOWN`]).
    pub const fn is_known(self) -> bool {
        self.0 != Self::UNKNOWN.0
    }

    /// The epoch after this one, as the metadata gives the next owner of a queue; `None` past
    /// `u64::MAX`.
    pub const fn next(self) -> Option<Self> {
        match self.0.checked_add(1) {
            Some(n) => Some(Self(n)),
            None => None,
        }
    }
}

impl fmt::Display for PlacementEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A queue shard: the Raft group holding the data of some replicated queues. Assigned by the
/// metadata from a counter that never gives one twice; its Raft group has the same number (the
/// metadata's own group is 0, never a shard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub u64);

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shard {}", self.0)
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
                reason: format!(
                    "{:?} is not a session id (16 hex digits from CreateSession)",
                    shown(s)
                ),
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
                    "{:?} is not a message id (they look like ID:5c0e1f2a3b4d5e6f-42)",
                    shown(text)
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
                "property name {:?} must start with a letter, _ or $",
                shown(name)
            )))
        }
        _ => {}
    }
    if let Some(c) = chars.find(|&c| !(c.is_alphanumeric() || c == '_' || c == '$')) {
        return Err(bad(format!(
            "property name {:?} contains {c:?}; use letters, digits, _ or $",
            shown(name)
        )));
    }
    if name.starts_with("JMS") {
        return Err(bad(format!(
            "property name {:?} starts with JMS, which is reserved",
            shown(name)
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

/// The token a consumer acknowledges with. It names the queue, its placement unit (any front-end
/// routes an ack by the queue's owner in placement, never by a node written in the handle,
/// which would go stale when the queue moves), and the exact delivery (queue incarnation, seq,
/// lease, delivery count), so a stale handle never acknowledges a newer delivery of the same
/// message, not even after a restart or a queue deleted and created again. `tag` is a check
/// value the delivering back-end computes from the rest with a secret of its own: a handle cannot
/// be guessed from what a message id, a browse or a history shows.
///
/// Text form: `r3.<uid hex>.<seq>.<lease>.<count>.<tag hex>.<queue>` (the queue last: it may
/// contain dots). The previous form, `r2.<node>.` and the same fields, is still read (its node
/// is ignored), so handles issued by a node of the previous release keep working through a
/// rolling upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReceiptHandle {
    pub queue: QueueName,
    pub uid: QueueUid,
    pub seq: Seq,
    pub lease: LeaseId,
    pub delivery_count: u32,
    pub tag: u64,
}

impl fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "r3.{:x}.{}.{}.{}.{:016x}.{}",
            self.uid.0, self.seq.0, self.lease.0, self.delivery_count, self.tag, self.queue
        )
    }
}

impl FromStr for ReceiptHandle {
    type Err = KernelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || KernelError::InvalidArgument {
            field: "receipt_handle",
            reason: format!("{:?} is not a receipt handle from a delivery", shown(s)),
        };
        let mut parts = match s.split_once('.') {
            Some(("r3", rest)) => rest.splitn(6, '.'),
            Some(("r2", rest)) => {
                let (node, rest) = rest.split_once('.').ok_or_else(bad)?;
                NodeId::new(node).map_err(|_| bad())?;
                rest.splitn(6, '.')
            }
            _ => return Err(bad()),
        };
        let hex = |p: Option<&str>| {
            p.and_then(|p| u64::from_str_radix(p, 16).ok())
                .ok_or_else(bad)
        };
        let uid = hex(parts.next())?;
        let mut number = || {
            parts
                .next()
                .and_then(|p| p.parse::<u64>().ok())
                .ok_or_else(bad)
        };
        let seq = Seq(number()?);
        let lease = LeaseId(number()?);
        let delivery_count = u32::try_from(number()?).map_err(|_| bad())?;
        let tag = hex(parts.next())?;
        let queue = QueueName::new(parts.next().ok_or_else(bad)?).map_err(|_| bad())?;
        Ok(Self {
            queue,
            uid: QueueUid(uid),
            seq,
            lease,
            delivery_count,
            tag,
        })
    }
}

/// What listings, message history and logs show of an id that is also a credential (a session
/// id, a connection id): a digest keyed with a secret of the showing process, so what operators
/// see can never be used to act as that session or connection. The key is the shell's (the
/// kernel has no random source).
#[derive(Debug, Clone, Copy)]
pub struct PublicIds {
    key: (u64, u64),
}

impl PublicIds {
    pub fn new(key: (u64, u64)) -> Self {
        Self { key }
    }

    fn digest(&self, bytes: &[u8]) -> u32 {
        use std::hash::Hasher as _;
        let mut h = siphasher::sip::SipHasher24::new_with_keys(self.key.0, self.key.1);
        h.write(bytes);
        // The low half is enough to tell sessions apart in a listing, and says nothing more.
        h.finish() as u32
    }

    /// `s` and 8 hex digits.
    pub fn session(&self, id: SessionId) -> String {
        format!("s{:08x}", self.digest(&id.0.to_be_bytes()))
    }

    /// `c` and 8 hex digits.
    pub fn connection(&self, id: &str) -> String {
        format!("c{:08x}", self.digest(id.as_bytes()))
    }
}

/// The most characters of a caller's value that an error message or log line repeats.
pub const SHOWN_CHARS_MAX: usize = 64;

/// A caller's value as an error message or a log line repeats it: control characters escaped
/// (a newline cannot forge a log line) and at most [`SHOWN_CHARS_MAX`] characters, with the
/// full length said (a 60 MiB id cannot make a 60 MiB answer).
pub fn shown(value: &str) -> String {
    let mut out = String::new();
    for (i, c) in value.chars().enumerate() {
        if i == SHOWN_CHARS_MAX {
            out.push_str(&format!("…({} bytes in all)", value.len()));
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Messages are shared between the queue, deliveries and the store without copying bodies.
pub(crate) type SharedMessage = Arc<Message>;

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str) -> QueueName {
        QueueName::new(name).unwrap()
    }

    #[test]
    fn temporary_queue_names_carry_their_node() {
        let node = NodeId::new("node-1").unwrap();
        let tmp = QueueName::temporary(&node, "x7", 3).unwrap();
        assert_eq!(tmp.as_str(), "tmp.node-1.x7.3");
        assert!(tmp.is_temporary());
        assert_eq!(tmp.temporary_node(), Some("node-1"));
        assert!(!q("orders").is_temporary());
        assert_eq!(q("orders").temporary_node(), None);
        // The prefix is the rule, with its dot: `tmpfoo` is an ordinary queue.
        assert!(!q("tmpfoo").is_temporary());
        assert!(q("tmp.").is_temporary());
        assert_eq!(q("tmp.").temporary_node(), Some(""));
    }

    #[test]
    fn dead_letter_queue_is_named_after_its_queue() {
        let orders = q("orders.eu");
        let dlq = orders.dead_letter_queue().unwrap();
        assert_eq!(dlq.as_str(), "orders.eu.DLQ");
        assert!(dlq.is_dead_letter_queue());
        assert!(!orders.is_dead_letter_queue());
        assert_eq!(dlq.dead_letter_source(), Some(orders));
        assert_eq!(q("orders").dead_letter_source(), None);
        // The suffix is case-sensitive and needs its dot.
        assert!(!q("orders.dlq").is_dead_letter_queue());
        assert!(!q("ordersDLQ").is_dead_letter_queue());
        assert_eq!(q("x.DLQ").dead_letter_source(), Some(q("x")));
    }

    #[test]
    fn dead_letter_queue_of_a_longest_name_does_not_exist() {
        let longest = q(&"a".repeat(QueueName::LEN_MAX));
        assert_eq!(longest.dead_letter_queue(), None);
        let fits = q(&"a".repeat(QueueName::LEN_MAX - QueueName::DEAD_LETTER_SUFFIX.len()));
        assert_eq!(
            fits.dead_letter_queue().unwrap().as_str().len(),
            QueueName::LEN_MAX
        );
    }

    #[test]
    fn shown_values_are_short_and_single_line() {
        assert_eq!(shown("orders"), "orders");
        assert_eq!(shown("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
        let long = "x".repeat(10_000);
        let s = shown(&long);
        assert!(s.starts_with(&"x".repeat(SHOWN_CHARS_MAX)));
        assert!(s.ends_with("…(10000 bytes in all)"), "{s}");
        assert!(s.len() < 100);
    }

    #[test]
    fn receipt_handle_round_trips_with_dots_in_queue_name() {
        let h = ReceiptHandle {
            queue: QueueName::new("orders.eu.DLQ").unwrap(),
            uid: QueueUid(0xabc),
            seq: Seq(42),
            lease: LeaseId(7),
            delivery_count: 2,
            tag: 0xdead_beef_0123_4567,
        };
        assert_eq!(
            h.to_string(),
            "r3.abc.42.7.2.deadbeef01234567.orders.eu.DLQ"
        );
        assert_eq!(h.to_string().parse::<ReceiptHandle>().unwrap(), h);
        // The previous form, with the node, is read for a rolling upgrade; its node is ignored.
        let previous = "r2.node-1.abc.42.7.2.deadbeef01234567.orders.eu.DLQ";
        assert_eq!(previous.parse::<ReceiptHandle>().unwrap(), h);
        assert!("r2.bad node.abc.42.7.2.ff.q"
            .parse::<ReceiptHandle>()
            .is_err());
        assert!("r3.1.2.q".parse::<ReceiptHandle>().is_err());
        assert!("r3.1.x.2.1.ff.q".parse::<ReceiptHandle>().is_err());
        assert!("r3.1.1.2.1.ff".parse::<ReceiptHandle>().is_err());
        assert!("r2.node.1.2.q".parse::<ReceiptHandle>().is_err());
        assert!("r2.node.1.x.2.1.ff.q".parse::<ReceiptHandle>().is_err());
        assert!("r2.node.zz.1.2.1.ff.q".parse::<ReceiptHandle>().is_err());
        assert!("r2.node.1.1.2.99999999999.ff.q"
            .parse::<ReceiptHandle>()
            .is_err());
        assert!("r2.node.1.1.2.1.ff".parse::<ReceiptHandle>().is_err());
        assert!("r2.node.1.1.2.1.zz.q".parse::<ReceiptHandle>().is_err());
        // The version before check values: refused, like any handle from before a restart.
        assert!("r1.node.1.1.2.1.q".parse::<ReceiptHandle>().is_err());
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

    #[test]
    fn placement_epochs_grow_from_static_and_unknown_is_not_checked() {
        assert!(!PlacementEpoch::UNKNOWN.is_known());
        assert_eq!(PlacementEpoch::default(), PlacementEpoch::UNKNOWN);
        assert!(PlacementEpoch::STATIC.is_known());
        assert_eq!(PlacementEpoch::UNKNOWN.next(), Some(PlacementEpoch::STATIC));
        let next = PlacementEpoch::STATIC.next().unwrap();
        assert!(next > PlacementEpoch::STATIC);
        assert_eq!(next.get(), 2);
        assert_eq!(next.to_string(), "2");
        assert_eq!(PlacementEpoch::new(u64::MAX).next(), None);
    }
}
