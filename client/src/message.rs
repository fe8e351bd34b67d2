//! Messages to send and messages received.

use std::collections::HashMap;

use ferry_proto::pb;

/// A message to send, built fluently: `Message::text("hi").property("n", 5).priority(7)`.
#[derive(Debug, Clone, Default)]
pub struct Message(pub pb::OutgoingMessage);

impl Message {
    pub fn bytes(body: impl Into<Vec<u8>>) -> Self {
        Self(pb::OutgoingMessage {
            body: body.into().into(),
            ..Default::default()
        })
    }

    pub fn text(body: impl Into<String>) -> Self {
        Self::bytes(body.into().into_bytes())
    }

    pub fn property(mut self, name: impl Into<String>, value: impl Into<PropertyValue>) -> Self {
        self.0.properties.insert(name.into(), value.into().0);
        self
    }

    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.0.correlation_id = Some(id.into());
        self
    }

    pub fn reply_to(mut self, queue: impl Into<String>) -> Self {
        self.0.reply_to = queue.into();
        self
    }

    pub fn jms_type(mut self, t: impl Into<String>) -> Self {
        self.0.r#type = t.into();
        self
    }

    pub fn priority(mut self, p: u32) -> Self {
        self.0.priority = Some(p);
        self
    }

    pub fn ttl_ms(mut self, ms: u64) -> Self {
        self.0.time_to_live_ms = Some(ms);
        self
    }

    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.0.delivery_delay_ms = Some(ms);
        self
    }

    /// JMSXGroupID: messages of one group go to one consumer at a time, in order.
    pub fn group_id(mut self, group: impl Into<String>) -> Self {
        self.0.group_id = group.into();
        self
    }

    /// A producer dedup id: a repeat within the queue's dedup window returns the first send's
    /// message id and stores nothing new.
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.0.dedup_id = id.into();
        self
    }

    pub fn non_persistent(mut self) -> Self {
        self.0.delivery_mode = pb::DeliveryMode::NonPersistent as i32;
        self
    }
}

/// A typed property value (see [`Message::property`]).
#[derive(Debug, Clone)]
pub struct PropertyValue(pub pb::PropertyValue);

macro_rules! property_from {
    ($($t:ty => $variant:ident),*) => {$(
        impl From<$t> for PropertyValue {
            fn from(v: $t) -> Self {
                PropertyValue(pb::PropertyValue { value: Some(pb::property_value::Value::$variant(v.into())) })
            }
        }
    )*};
}
property_from!(bool => BoolValue, i32 => IntValue, i64 => LongValue, f64 => DoubleValue, String => StringValue, &str => StringValue);

/// A received message with its delivery details.
#[derive(Debug, Clone)]
pub struct Received {
    pub delivery: pb::Delivery,
}

impl Received {
    pub fn message(&self) -> &pb::Message {
        static EMPTY: std::sync::OnceLock<pb::Message> = std::sync::OnceLock::new();
        self.delivery
            .message
            .as_ref()
            .unwrap_or_else(|| EMPTY.get_or_init(pb::Message::default))
    }

    pub fn message_id(&self) -> &str {
        &self.message().message_id
    }

    pub fn body(&self) -> &[u8] {
        &self.message().body
    }

    pub fn properties(&self) -> &HashMap<String, pb::PropertyValue> {
        &self.message().properties
    }

    pub fn receipt_handle(&self) -> &str {
        &self.delivery.receipt_handle
    }

    pub fn delivery_count(&self) -> u32 {
        self.delivery.delivery_count
    }

    pub fn redelivered(&self) -> bool {
        self.delivery.redelivered
    }
}
