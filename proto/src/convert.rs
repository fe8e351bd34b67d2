//! Wire ↔ domain conversion, in one place. Decoding checks everything the wire type cannot
//! express (ranges, names, types) and fails with a [`KernelError`] naming the field.

use ferry_kernel::{
    DeadLetterTarget, Delivery, KernelError, Message, MessageState, NewMessage, Priority,
    PropertyValue, QueueConfig, QueueName, QueueStats, ReceiptHandle, RedeliveryPolicy,
};

use crate::v1 as pb;

impl From<&PropertyValue> for pb::PropertyValue {
    fn from(v: &PropertyValue) -> Self {
        use pb::property_value::Value;
        let value = match v {
            PropertyValue::Bool(b) => Value::BoolValue(*b),
            PropertyValue::Int(i) => Value::IntValue(*i),
            PropertyValue::Long(l) => Value::LongValue(*l),
            PropertyValue::Double(d) => Value::DoubleValue(*d),
            PropertyValue::String(s) => Value::StringValue(s.clone()),
        };
        pb::PropertyValue { value: Some(value) }
    }
}

/// Decodes one property; `name` is only used in the error.
pub fn property_from_pb(name: &str, v: pb::PropertyValue) -> Result<PropertyValue, KernelError> {
    use pb::property_value::Value;
    match v.value {
        Some(Value::BoolValue(b)) => Ok(PropertyValue::Bool(b)),
        Some(Value::IntValue(i)) => Ok(PropertyValue::Int(i)),
        Some(Value::LongValue(l)) => Ok(PropertyValue::Long(l)),
        Some(Value::DoubleValue(d)) => Ok(PropertyValue::Double(d)),
        Some(Value::StringValue(s)) => Ok(PropertyValue::String(s)),
        None => Err(KernelError::InvalidArgument {
            field: "properties",
            reason: format!(
                "property {:?} has no value; set one of its typed fields",
                ferry_kernel::shown(name)
            ),
        }),
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

impl TryFrom<pb::OutgoingMessage> for NewMessage {
    type Error = KernelError;

    fn try_from(m: pb::OutgoingMessage) -> Result<Self, Self::Error> {
        let persistent = match pb::DeliveryMode::try_from(m.delivery_mode) {
            Ok(pb::DeliveryMode::Unspecified | pb::DeliveryMode::Persistent) => true,
            Ok(pb::DeliveryMode::NonPersistent) => false,
            Err(_) => {
                return Err(KernelError::InvalidArgument {
                    field: "delivery_mode",
                    reason: format!("{} is not a delivery mode", m.delivery_mode),
                })
            }
        };
        let properties = m
            .properties
            .into_iter()
            .map(|(k, v)| property_from_pb(&k, v).map(|v| (k, v)))
            .collect::<Result<_, _>>()?;
        let reply_to = non_empty(m.reply_to)
            .map(QueueName::new)
            .transpose()
            .map_err(|e| KernelError::InvalidArgument {
                field: "reply_to",
                reason: e.to_string(),
            })?;
        Ok(NewMessage {
            // The kernel's own allocation (one copy, as decoding into a `Vec` made before).
            body: m.body.into(),
            properties,
            correlation_id: m.correlation_id,
            reply_to,
            jms_type: non_empty(m.r#type),
            priority: m
                .priority
                .map(Priority::new)
                .transpose()?
                .unwrap_or_default(),
            time_to_live_ms: m.time_to_live_ms,
            delivery_delay_ms: m.delivery_delay_ms,
            persistent,
            dedup_id: non_empty(m.dedup_id),
            group_id: non_empty(m.group_id),
        })
    }
}

/// The wire form of a stored message.
pub fn message_to_pb(m: &Message, queue: &QueueName) -> pb::Message {
    pb::Message {
        message_id: m.id.to_string(),
        queue: queue.to_string(),
        body: m.body.clone(),
        properties: m
            .properties
            .iter()
            .map(|(k, v)| (k.clone(), v.into()))
            .collect(),
        correlation_id: m.correlation_id.clone(),
        reply_to: m
            .reply_to
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        r#type: m.jms_type.clone().unwrap_or_default(),
        priority: m.priority.get().into(),
        timestamp_ms: m.timestamp_ms,
        expiration_ms: m.expiration_ms.unwrap_or(0),
        delivery_time_ms: m.deliver_at_ms.unwrap_or(0),
        delivery_mode: if m.persistent {
            pb::DeliveryMode::Persistent
        } else {
            pb::DeliveryMode::NonPersistent
        } as i32,
        group_id: m.group_id.clone().unwrap_or_default(),
    }
}

/// The wire form of a delivery, with the receipt handle the back-end minted for it.
pub fn delivery_to_pb(d: &Delivery, handle: &ReceiptHandle) -> pb::Delivery {
    pb::Delivery {
        message: Some(message_to_pb(&d.message, &handle.queue)),
        receipt_handle: handle.to_string(),
        delivery_count: d.delivery_count,
        redelivered: d.redelivered(),
        lease_expires_at_ms: d.lease_until_ms,
    }
}

pub fn state_to_pb(s: MessageState) -> pb::MessageState {
    match s {
        MessageState::Ready => pb::MessageState::Ready,
        MessageState::Scheduled { .. } => pb::MessageState::Scheduled,
        MessageState::Leased { .. } => pb::MessageState::Leased,
    }
}

/// Applies the fields set on the wire over `base` (the server's defaults).
pub fn queue_config_from_pb(
    c: Option<pb::QueueConfig>,
    base: &QueueConfig,
) -> Result<QueueConfig, KernelError> {
    let c = c.unwrap_or_default();
    let r = c.redelivery.unwrap_or_default();
    let b = &base.redelivery;
    let collision = match r.collision_avoidance_percent {
        None => b.collision_avoidance_percent,
        Some(p) => u8::try_from(p).ok().filter(|p| *p <= 100).ok_or_else(|| {
            KernelError::InvalidArgument {
                field: "redelivery.collision_avoidance_percent",
                reason: format!("must be between 0 and 100, got {p}"),
            }
        })?,
    };
    let redelivery = RedeliveryPolicy {
        max_redeliveries: if r.unlimited_redeliveries {
            None
        } else {
            r.max_redeliveries.map_or(b.max_redeliveries, Some)
        },
        initial_delay_ms: r.initial_delay_ms.unwrap_or(b.initial_delay_ms),
        delay_ms: r.delay_ms.unwrap_or(b.delay_ms),
        exponential_backoff: r.exponential_backoff.unwrap_or(b.exponential_backoff),
        backoff_multiplier: r.backoff_multiplier.unwrap_or(b.backoff_multiplier),
        collision_avoidance_percent: collision,
        max_delay_ms: r.max_delay_ms.unwrap_or(b.max_delay_ms),
    };
    Ok(QueueConfig {
        default_lease_ms: c.default_lease_ms.unwrap_or(base.default_lease_ms),
        lease_max_ms: c.lease_max_ms.unwrap_or(base.lease_max_ms),
        max_message_size_bytes: c
            .max_message_size_bytes
            .unwrap_or(base.max_message_size_bytes),
        receive_batch_max: c.receive_batch_max.unwrap_or(base.receive_batch_max),
        waiters_max: c.waiters_max.map_or(base.waiters_max, |w| w as usize),
        redelivery,
        dead_letter: target_from_pb(c.dead_letter, &base.dead_letter, "dead_letter.queue")?,
        expiry: target_from_pb(c.expiry, &base.expiry, "expiry.queue")?,
        dedup_window_ms: c.dedup_window_ms.unwrap_or(base.dedup_window_ms),
        max_messages: c
            .max_messages
            .map_or(base.max_messages, |n| (n > 0).then_some(n)),
        max_bytes: c.max_bytes.map_or(base.max_bytes, |n| (n > 0).then_some(n)),
    })
}

fn target_from_pb(
    t: Option<pb::DeadLetterTarget>,
    base: &DeadLetterTarget,
    field: &'static str,
) -> Result<DeadLetterTarget, KernelError> {
    use pb::dead_letter_target::Target;
    Ok(match t.and_then(|t| t.target) {
        None => base.clone(),
        Some(Target::Discard(true)) => DeadLetterTarget::Discard,
        Some(Target::Discard(false)) => DeadLetterTarget::Default,
        Some(Target::Queue(q)) => DeadLetterTarget::Queue(QueueName::new(q).map_err(|e| {
            KernelError::InvalidArgument {
                field,
                reason: e.to_string(),
            }
        })?),
    })
}

/// A queue's settings as the API shows them; the default dead-letter target is shown resolved
/// (`<queue>.DLQ`).
pub fn queue_config_to_pb(name: &QueueName, c: &QueueConfig) -> pb::QueueConfig {
    let r = &c.redelivery;
    let target = |t: &DeadLetterTarget| {
        use pb::dead_letter_target::Target;
        Some(pb::DeadLetterTarget {
            target: Some(match t.resolve(name) {
                Some(q) => Target::Queue(q.to_string()),
                None => Target::Discard(true),
            }),
        })
    };
    pb::QueueConfig {
        default_lease_ms: Some(c.default_lease_ms),
        lease_max_ms: Some(c.lease_max_ms),
        max_message_size_bytes: Some(c.max_message_size_bytes),
        receive_batch_max: Some(c.receive_batch_max),
        waiters_max: Some(u32::try_from(c.waiters_max).unwrap_or(u32::MAX)),
        redelivery: Some(pb::RedeliveryPolicy {
            max_redeliveries: r.max_redeliveries,
            unlimited_redeliveries: r.max_redeliveries.is_none(),
            initial_delay_ms: Some(r.initial_delay_ms),
            delay_ms: Some(r.delay_ms),
            exponential_backoff: Some(r.exponential_backoff),
            backoff_multiplier: Some(r.backoff_multiplier),
            collision_avoidance_percent: Some(r.collision_avoidance_percent.into()),
            max_delay_ms: Some(r.max_delay_ms),
        }),
        dead_letter: target(&c.dead_letter),
        expiry: target(&c.expiry),
        dedup_window_ms: Some(c.dedup_window_ms),
        max_messages: c.max_messages,
        max_bytes: c.max_bytes,
    }
}

/// `now_ms`: the owning node's clock, for the oldest ready message's age.
pub fn queue_stats_to_pb(
    name: &QueueName,
    owner: &str,
    s: &QueueStats,
    now_ms: u64,
) -> pb::QueueStats {
    pb::QueueStats {
        name: name.to_string(),
        ready: s.ready,
        scheduled: s.scheduled,
        leased: s.leased,
        consumers: s.waiters,
        bytes: s.bytes,
        sent_total: s.sent_total,
        delivered_total: s.delivered_total,
        redelivered_total: s.redelivered_total,
        acked_total: s.acked_total,
        expired_total: s.expired_total,
        lease_expired_total: s.lease_expired_total,
        purged_total: s.purged_total,
        owner_node: owner.to_string(),
        dead_lettered_max_deliveries_total: s.dead_lettered.max_deliveries,
        dead_lettered_rejected_total: s.dead_lettered.rejected,
        staged: s.staged,
        groups: s.groups,
        oldest_ready_timestamp_ms: s.oldest_ready_timestamp_ms.unwrap_or(0),
        oldest_ready_age_ms: s
            .oldest_ready_timestamp_ms
            .map_or(0, |t| now_ms.saturating_sub(t)),
        paged_out: s.paged_out,
        memory_bytes: s.resident_bytes,
        memory_budget_bytes: if s.memory_budget_bytes == u64::MAX {
            0
        } else {
            s.memory_budget_bytes
        },
    }
}

/// The gRPC code for a kernel refusal, the same in every service: caller mistakes are
/// INVALID_ARGUMENT, limits RESOURCE_EXHAUSTED, a stale receipt FAILED_PRECONDITION, another
/// session's delivery PERMISSION_DENIED.
pub fn kernel_error_code(e: &KernelError) -> tonic::Code {
    match e {
        KernelError::NegativeTimeout { .. }
        | KernelError::InvalidArgument { .. }
        | KernelError::InvalidSelector { .. } => tonic::Code::InvalidArgument,
        KernelError::OverLimit { .. }
        | KernelError::MessageTooLarge { .. }
        | KernelError::TooManyWaiters { .. }
        | KernelError::QueueFull { .. } => tonic::Code::ResourceExhausted,
        KernelError::StaleReceipt { .. }
        | KernelError::MessageLeased { .. }
        | KernelError::DedupInTransaction { .. } => tonic::Code::FailedPrecondition,
        KernelError::NotOwner { .. } => tonic::Code::PermissionDenied,
        KernelError::NoSuchMessage { .. } => tonic::Code::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outgoing_message_decodes_with_defaults() {
        let m = NewMessage::try_from(pb::OutgoingMessage {
            body: b"x".to_vec().into(),
            correlation_id: Some(" Abc ".into()),
            ..Default::default()
        })
        .unwrap();
        assert!(m.persistent, "persistent is the JMS default");
        assert_eq!(m.priority, Priority::DEFAULT);
        assert_eq!(
            m.correlation_id.as_deref(),
            Some(" Abc "),
            "kept byte for byte"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let err = NewMessage::try_from(pb::OutgoingMessage {
            priority: Some(10),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("priority"), "{err}");
        let mut props = std::collections::HashMap::new();
        props.insert("n".to_string(), pb::PropertyValue { value: None });
        let err = NewMessage::try_from(pb::OutgoingMessage {
            properties: props,
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("\"n\""), "{err}");
    }
}
