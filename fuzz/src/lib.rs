//! What both selector fuzz targets check once a selector has parsed.

use std::collections::BTreeMap;

use ferry_kernel::{
    Message, MessageId, Priority, PropertyValue, QueueUid, Selector, SelectorLimits, Seq,
};

/// Limits loose enough for any selector that parsed under `limits` to still parse when it is
/// written twice, wrapped in a few `NOT (...)` or compared with TRUE: the derived selectors below
/// must never be refused for their size.
fn roomier(limits: &SelectorLimits) -> SelectorLimits {
    SelectorLimits {
        length_chars_max: limits.length_chars_max * 2 + 64,
        depth_max: limits.depth_max + 8,
        nodes_max: limits.nodes_max * 2 + 8,
        in_list_max: limits.in_list_max,
        like_pattern_chars_max: limits.like_pattern_chars_max,
    }
}

fn derived(text: &str, limits: &SelectorLimits) -> Selector {
    Selector::parse(text, limits)
        .unwrap_or_else(|e| panic!("{text:?} was refused although its parts parse: {e}"))
}

/// A message with default headers and the given properties.
pub fn message(properties: BTreeMap<String, PropertyValue>) -> Message {
    Message {
        id: MessageId::new(QueueUid(7), Seq(42)),
        seq: Seq(42),
        body: Vec::new(),
        properties,
        correlation_id: None,
        reply_to: None,
        jms_type: None,
        priority: Priority::DEFAULT,
        timestamp_ms: 1_700_000_000_000,
        expiration_ms: None,
        deliver_at_ms: None,
        persistent: true,
        dedup_id: None,
        group_id: None,
    }
}

/// Checks the laws every parsed selector must obey against `m`.
///
/// `Selector::matches` exposes only TRUE (a match). FALSE and UNKNOWN are told apart with an
/// equality on the condition, which involves no NOT: `(s) = TRUE` matches when `s` is TRUE,
/// `(s) = FALSE` when it is FALSE, and neither when it is UNKNOWN (a comparison with UNKNOWN is
/// UNKNOWN). The laws:
/// - evaluation is deterministic (twice, on a clone, and after parsing the same text again);
/// - `(s) = TRUE` matches exactly when `s` does;
/// - NOT is the three-valued complement: `NOT (s)` is TRUE when `s` is FALSE, FALSE when `s` is
///   TRUE, UNKNOWN when `s` is UNKNOWN (each read through the equalities above); and
///   `NOT (NOT (s))` matches exactly when `s` does;
/// - `(s) OR NOT (s)` matches exactly when `s` is not UNKNOWN; `(s) AND NOT (s)` never matches;
///   `(s) AND (s)` and `(s) OR (s)` match exactly when `s` does;
/// - when `correlation_id_equals` names a literal, only a message with that correlation id
///   matches (the broker may use it to replace a scan with an index lookup).
pub fn check_laws(selector: &Selector, limits: &SelectorLimits, m: &Message, delivery_count: u32) {
    let text = selector.text();
    let positive = selector.matches(m, delivery_count);
    assert_eq!(
        selector.matches(m, delivery_count),
        positive,
        "{text:?}: evaluated twice, different answers"
    );
    assert_eq!(
        selector.clone().matches(m, delivery_count),
        positive,
        "{text:?}: a clone answers differently"
    );
    assert_eq!(
        derived(text, limits).matches(m, delivery_count),
        positive,
        "{text:?}: parsed again, answers differently"
    );

    let roomy = roomier(limits);
    let eval = |derived_text: String| derived(&derived_text, &roomy).matches(m, delivery_count);
    // TRUE, FALSE or UNKNOWN (None), without NOT.
    let truth = |s: &str| match (
        eval(format!("({s}) = TRUE")),
        eval(format!("({s}) = FALSE")),
    ) {
        (true, true) => panic!("{s:?} is both TRUE and FALSE"),
        (true, false) => Some(true),
        (false, true) => Some(false),
        (false, false) => None,
    };
    let value = truth(text);
    assert_eq!(
        value == Some(true),
        positive,
        "{text:?}: matches is {positive}, but (s) = TRUE says {value:?}"
    );
    let not_text = format!("NOT ({text})");
    let negated = truth(&not_text);
    assert_eq!(
        negated,
        value.map(|t| !t),
        "{text:?} is {value:?} but NOT ({text}) is {negated:?}"
    );
    let negative = eval(not_text);
    assert_eq!(
        negative,
        value == Some(false),
        "{text:?} is {value:?} but NOT ({text}) matches: {negative}"
    );
    assert_eq!(
        eval(format!("NOT (NOT ({text}))")),
        positive,
        "{text:?}: NOT (NOT (s)) differs from s"
    );
    assert_eq!(
        eval(format!("({text}) OR NOT ({text})")),
        value.is_some(),
        "{text:?} is {value:?}: (s) OR NOT (s) should be TRUE exactly when s is not UNKNOWN"
    );
    assert!(
        !eval(format!("({text}) AND NOT ({text})")),
        "{text:?}: (s) AND NOT (s) matched"
    );
    assert_eq!(
        eval(format!("({text}) AND ({text})")),
        positive,
        "{text:?}: (s) AND (s)"
    );
    assert_eq!(
        eval(format!("({text}) OR ({text})")),
        positive,
        "{text:?}: (s) OR (s)"
    );

    if let Some(literal) = selector.correlation_id_equals() {
        if positive {
            assert_eq!(
                m.correlation_id.as_deref(),
                Some(literal),
                "{text:?} matched a message whose correlation id is not the indexed literal"
            );
        }
    }
}
