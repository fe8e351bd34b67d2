//! What deleting a message needs to know of it: the keys it is filed under and its size, never
//! its body. A replicated log entry carries a delete in this form ([`crate::entry`]).

use ferry_kernel::{IndexedHeader, Message, Priority, Seq};

/// What a store needs to delete one message: where it is filed (priority and sequence number;
/// the indexed headers; its delivery time) and its size, for the counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageKeys {
    pub priority: Priority,
    pub seq: Seq,
    /// `Message::size_bytes` of the message.
    pub size_bytes: u64,
    pub correlation_id: Option<String>,
    pub group_id: Option<String>,
    pub deliver_at_ms: Option<u64>,
}

impl MessageKeys {
    /// The keys and size of `m`.
    pub fn of(m: &Message) -> Self {
        KeysRef::of_message(m).to_owned()
    }
}

/// A borrowed [`MessageKeys`], taken from a message or from [`MessageKeys`]: the stores' delete
/// path uses it, so deleting a message the kernel handed over allocates nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeysRef<'a> {
    pub(crate) priority: Priority,
    pub(crate) seq: Seq,
    pub(crate) size_bytes: u64,
    correlation_id: Option<&'a str>,
    group_id: Option<&'a str>,
    pub(crate) deliver_at_ms: Option<u64>,
}

impl<'a> KeysRef<'a> {
    pub(crate) fn of_message(m: &'a Message) -> Self {
        KeysRef {
            priority: m.priority,
            seq: m.seq,
            size_bytes: m.size_bytes(),
            correlation_id: m.correlation_id.as_deref(),
            group_id: m.group_id.as_deref(),
            deliver_at_ms: m.deliver_at_ms,
        }
    }

    pub(crate) fn of_keys(k: &'a MessageKeys) -> Self {
        KeysRef {
            priority: k.priority,
            seq: k.seq,
            size_bytes: k.size_bytes,
            correlation_id: k.correlation_id.as_deref(),
            group_id: k.group_id.as_deref(),
            deliver_at_ms: k.deliver_at_ms,
        }
    }

    /// The value of an indexed header, as [`IndexedHeader::value_of`] gives it for the message.
    pub(crate) fn header(&self, h: IndexedHeader) -> Option<&'a str> {
        match h {
            IndexedHeader::CorrelationId => self.correlation_id,
            IndexedHeader::GroupId => self.group_id,
        }
    }

    fn to_owned(self) -> MessageKeys {
        MessageKeys {
            priority: self.priority,
            seq: self.seq,
            size_bytes: self.size_bytes,
            correlation_id: self.correlation_id.map(str::to_owned),
            group_id: self.group_id.map(str::to_owned),
            deliver_at_ms: self.deliver_at_ms,
        }
    }
}
