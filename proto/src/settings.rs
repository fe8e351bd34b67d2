//! Queue settings on the wire as changes: applying a change to settings (`UpdateQueue`), and
//! what differs between two settings, field by field (for the answer, the event and the log of
//! an update, and the warning of a create that found the queue with other settings).

use crate::pb;

/// Applies `patch` to `base`: each field set in `patch` replaces `base`'s, the others stay. In
/// the redelivery policy, `max_redeliveries` set turns `unlimited_redeliveries` off and
/// `unlimited_redeliveries` true turns it on (and drops `max_redeliveries`).
pub fn merge_queue_config(base: &pb::QueueConfig, patch: &pb::QueueConfig) -> pb::QueueConfig {
    fn pick<T: Clone>(base: &Option<T>, patch: &Option<T>) -> Option<T> {
        patch.clone().or_else(|| base.clone())
    }
    let redelivery = match (&base.redelivery, &patch.redelivery) {
        (b, None) => *b,
        (None, Some(p)) => Some(*p),
        (Some(b), Some(p)) => {
            let (max_redeliveries, unlimited_redeliveries) = if p.unlimited_redeliveries {
                (None, true)
            } else if p.max_redeliveries.is_some() {
                (p.max_redeliveries, false)
            } else {
                (b.max_redeliveries, b.unlimited_redeliveries)
            };
            Some(pb::RedeliveryPolicy {
                max_redeliveries,
                unlimited_redeliveries,
                initial_delay_ms: pick(&b.initial_delay_ms, &p.initial_delay_ms),
                delay_ms: pick(&b.delay_ms, &p.delay_ms),
                exponential_backoff: pick(&b.exponential_backoff, &p.exponential_backoff),
                backoff_multiplier: pick(&b.backoff_multiplier, &p.backoff_multiplier),
                collision_avoidance_percent: pick(
                    &b.collision_avoidance_percent,
                    &p.collision_avoidance_percent,
                ),
                max_delay_ms: pick(&b.max_delay_ms, &p.max_delay_ms),
            })
        }
    };
    pb::QueueConfig {
        default_lease_ms: pick(&base.default_lease_ms, &patch.default_lease_ms),
        lease_max_ms: pick(&base.lease_max_ms, &patch.lease_max_ms),
        max_message_size_bytes: pick(&base.max_message_size_bytes, &patch.max_message_size_bytes),
        receive_batch_max: pick(&base.receive_batch_max, &patch.receive_batch_max),
        waiters_max: pick(&base.waiters_max, &patch.waiters_max),
        redelivery,
        dead_letter: pick(&base.dead_letter, &patch.dead_letter),
        expiry: pick(&base.expiry, &patch.expiry),
        dedup_window_ms: pick(&base.dedup_window_ms, &patch.dedup_window_ms),
        max_messages: pick(&base.max_messages, &patch.max_messages),
        max_bytes: pick(&base.max_bytes, &patch.max_bytes),
    }
}

/// One setting that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingChange {
    /// The field, as `QueueConfig` names it (`redelivery.max_redeliveries`).
    pub field: &'static str,
    /// Its value before ("" when unset: the server's default).
    pub before: String,
    /// Its value after.
    pub after: String,
}

/// Every field of queue settings, as text (unset: ""), in `QueueConfig`'s order.
pub fn queue_config_fields(c: &pb::QueueConfig) -> Vec<(&'static str, String)> {
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map_or_else(String::new, |v| v.to_string())
    }
    fn limit(v: Option<u64>) -> String {
        match v {
            Some(0) => "unlimited".into(),
            v => opt(v),
        }
    }
    fn target(t: &Option<pb::DeadLetterTarget>) -> String {
        use pb::dead_letter_target::Target;
        match t.as_ref().map(|t| &t.target) {
            None => String::new(),
            Some(Some(Target::Queue(q))) => q.clone(),
            Some(Some(Target::Discard(true))) => "discard".into(),
            Some(_) => "default".into(),
        }
    }
    let r = c.redelivery.unwrap_or_default();
    let max_redeliveries = if r.unlimited_redeliveries {
        "unlimited".into()
    } else {
        opt(r.max_redeliveries)
    };
    vec![
        ("default_lease_ms", opt(c.default_lease_ms)),
        ("lease_max_ms", opt(c.lease_max_ms)),
        ("max_message_size_bytes", opt(c.max_message_size_bytes)),
        ("receive_batch_max", opt(c.receive_batch_max)),
        ("waiters_max", opt(c.waiters_max)),
        ("redelivery.max_redeliveries", max_redeliveries),
        ("redelivery.initial_delay_ms", opt(r.initial_delay_ms)),
        ("redelivery.delay_ms", opt(r.delay_ms)),
        ("redelivery.exponential_backoff", opt(r.exponential_backoff)),
        ("redelivery.backoff_multiplier", opt(r.backoff_multiplier)),
        (
            "redelivery.collision_avoidance_percent",
            opt(r.collision_avoidance_percent),
        ),
        ("redelivery.max_delay_ms", opt(r.max_delay_ms)),
        ("dead_letter", target(&c.dead_letter)),
        ("expiry", target(&c.expiry)),
        ("dedup_window_ms", opt(c.dedup_window_ms)),
        ("max_messages", limit(c.max_messages)),
        ("max_bytes", limit(c.max_bytes)),
    ]
}

/// The fields whose text differs between `before` and `after`, in `QueueConfig`'s order.
pub fn queue_config_changes(
    before: &pb::QueueConfig,
    after: &pb::QueueConfig,
) -> Vec<SettingChange> {
    queue_config_fields(before)
        .into_iter()
        .zip(queue_config_fields(after))
        .filter(|((_, b), (_, a))| a != b)
        .map(|((field, before), (_, after))| SettingChange {
            field,
            before,
            after,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redelivery(max: Option<u32>, unlimited: bool) -> pb::QueueConfig {
        pb::QueueConfig {
            redelivery: Some(pb::RedeliveryPolicy {
                max_redeliveries: max,
                unlimited_redeliveries: unlimited,
                delay_ms: Some(500),
                ..Default::default()
            }),
            default_lease_ms: Some(1_000),
            ..Default::default()
        }
    }

    #[test]
    fn a_patch_replaces_the_fields_it_sets_and_keeps_the_others() {
        let base = redelivery(Some(6), false);
        let patch = pb::QueueConfig {
            redelivery: Some(pb::RedeliveryPolicy {
                max_redeliveries: Some(3),
                ..Default::default()
            }),
            max_messages: Some(10),
            ..Default::default()
        };
        let merged = merge_queue_config(&base, &patch);
        let r = merged.redelivery.unwrap_or_default();
        assert_eq!(r.max_redeliveries, Some(3));
        assert_eq!(r.delay_ms, Some(500), "kept");
        assert_eq!(merged.default_lease_ms, Some(1_000), "kept");
        assert_eq!(merged.max_messages, Some(10));
        let changes = queue_config_changes(&base, &merged);
        let fields: Vec<_> = changes.iter().map(|c| c.field).collect();
        assert_eq!(fields, ["redelivery.max_redeliveries", "max_messages"]);
        assert_eq!(
            (changes[0].before.as_str(), changes[0].after.as_str()),
            ("6", "3")
        );
        assert!(queue_config_changes(&merged, &merge_queue_config(&merged, &patch)).is_empty());
    }

    #[test]
    fn unlimited_and_a_count_of_redeliveries_replace_each_other() {
        let unlimited = pb::QueueConfig {
            redelivery: Some(pb::RedeliveryPolicy {
                unlimited_redeliveries: true,
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = merge_queue_config(&redelivery(Some(6), false), &unlimited);
        let r = m.redelivery.unwrap_or_default();
        assert!(r.unlimited_redeliveries && r.max_redeliveries.is_none());
        let m = merge_queue_config(&m, &redelivery(Some(2), false));
        let r = m.redelivery.unwrap_or_default();
        assert!(!r.unlimited_redeliveries);
        assert_eq!(r.max_redeliveries, Some(2));
    }
}
