//! Behaviour of selectors: operators, precedence, three-valued logic, types, headers and LIKE.

use std::collections::BTreeMap;

use super::*;
use crate::types::{MessageId, Priority, PropertyValue as P, QueueUid, Seq};

/// A persistent message with default headers and the given properties.
pub(super) fn message(properties: &[(&str, P)]) -> Message {
    Message {
        id: MessageId::new(QueueUid(7), Seq(42)),
        seq: Seq(42),
        body: Default::default(),
        properties: properties
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
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

pub(super) fn selector(text: &str) -> Selector {
    Selector::parse(text, &SelectorLimits::default())
        .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
}

/// Whether `text` matches `m` on its first delivery.
pub(super) fn is_match(text: &str, m: &Message) -> bool {
    selector(text).matches(m, 1)
}

/// TRUE, FALSE or UNKNOWN (`None`): UNKNOWN is what matches neither `s` nor `NOT (s)`.
pub(super) fn truth(text: &str, m: &Message) -> Option<bool> {
    let positive = is_match(text, m);
    let negative = is_match(&format!("NOT ({text})"), m);
    assert!(
        !(positive && negative),
        "{text:?} and its negation both match"
    );
    match (positive, negative) {
        (true, _) => Some(true),
        (false, true) => Some(false),
        (false, false) => None,
    }
}

/// Asserts each selector's truth value against `m`.
pub(super) fn assert_truths(m: &Message, cases: &[(&str, Option<bool>)]) {
    for &(text, expected) in cases {
        assert_eq!(truth(text, m), expected, "{text}");
    }
}

fn numbers() -> Message {
    message(&[
        ("i", P::Int(3)),
        ("l", P::Long(3)),
        ("d", P::Double(3.0)),
        ("half", P::Double(0.5)),
        ("s", P::String("3".into())),
        ("flag", P::Bool(true)),
    ])
}

#[test]
fn equality_compares_numbers_strings_and_booleans() {
    let m = message(&[
        ("n", P::Int(5)),
        ("color", P::String("red".into())),
        ("flag", P::Bool(true)),
    ]);
    assert_truths(
        &m,
        &[
            ("n = 5", Some(true)),
            ("n <> 5", Some(false)),
            ("n = 6", Some(false)),
            ("color = 'red'", Some(true)),
            ("color = 'Red'", Some(false)),
            ("color <> 'blue'", Some(true)),
            ("flag = TRUE", Some(true)),
            ("flag <> false", Some(true)),
            ("TRUE = FALSE", Some(false)),
        ],
    );
}

#[test]
fn relational_operators_order_numbers() {
    let m = message(&[("n", P::Long(5))]);
    assert_truths(
        &m,
        &[
            ("n < 6", Some(true)),
            ("n < 5", Some(false)),
            ("n <= 5", Some(true)),
            ("n > 4", Some(true)),
            ("n > 5", Some(false)),
            ("n >= 5", Some(true)),
            ("n >= 5.5", Some(false)),
        ],
    );
}

#[test]
fn arithmetic_binds_sign_then_multiplication_then_addition() {
    let m = message(&[("x", P::Int(4))]);
    assert_truths(
        &m,
        &[
            ("2 + 3 * 4 = 14", Some(true)),
            ("(2 + 3) * 4 = 20", Some(true)),
            ("-2 * -3 = 6", Some(true)),
            ("- x * 2 = -8", Some(true)),
            ("+x = 4", Some(true)),
            ("-(x - 6) = 2", Some(true)),
            ("10 - 4 - 3 = 3", Some(true)),
            ("48 / 4 / 3 = 4", Some(true)),
            ("7 / 2 = 3", Some(true)),
            ("7.0 / 2 = 3.5", Some(true)),
            ("x * 2 > x + 3", Some(true)),
        ],
    );
}

#[test]
fn and_binds_tighter_than_or() {
    let m = message(&[]);
    // Read as (TRUE OR TRUE) AND FALSE it would be FALSE.
    assert_truths(
        &m,
        &[
            ("TRUE OR TRUE AND FALSE", Some(true)),
            ("FALSE AND TRUE OR TRUE", Some(true)),
            ("(TRUE OR TRUE) AND FALSE", Some(false)),
        ],
    );
}

#[test]
fn not_binds_looser_than_comparison_and_tighter_than_and() {
    let m = message(&[("x", P::Int(1))]);
    assert_truths(
        &m,
        &[
            ("NOT x = 2", Some(true)),
            ("NOT x BETWEEN 2 AND 3", Some(true)),
            // Read as NOT (FALSE AND FALSE) it would be TRUE.
            ("NOT FALSE AND FALSE", Some(false)),
            ("NOT NOT TRUE", Some(true)),
        ],
    );
}

#[test]
fn and_or_not_follow_sql_truth_tables() {
    let m = message(&[("t", P::Bool(true)), ("f", P::Bool(false))]);
    // `u` is absent: NULL, so UNKNOWN as a condition.
    let values = [("t", Some(true)), ("f", Some(false)), ("u", None)];
    for (a, ta) in values {
        assert_eq!(truth(&format!("NOT {a}"), &m), ta.map(|x| !x), "NOT {a}");
        for (b, tb) in values {
            let and = match (ta, tb) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            };
            let or = match (ta, tb) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            };
            assert_eq!(truth(&format!("{a} AND {b}"), &m), and, "{a} AND {b}");
            assert_eq!(truth(&format!("{a} OR {b}"), &m), or, "{a} OR {b}");
        }
    }
}

#[test]
fn long_and_or_chains_short_circuit_to_the_right_answer() {
    let m = message(&[("t", P::Bool(true))]);
    assert_truths(
        &m,
        &[
            ("u AND t AND FALSE", Some(false)),
            ("u OR t OR u", Some(true)),
            ("t AND (t AND (t AND u))", None),
            ("FALSE OR (FALSE OR (u OR FALSE))", None),
        ],
    );
}

#[test]
fn comparisons_and_arithmetic_with_null_are_unknown() {
    let m = message(&[("n", P::Int(1))]);
    assert_truths(
        &m,
        &[
            ("missing = 1", None),
            ("missing <> 1", None),
            ("missing < 1", None),
            ("missing = missing", None),
            ("missing + 1 = 1", None),
            ("-missing = 0", None),
            ("n * missing > 0", None),
            ("missing = 'x'", None),
        ],
    );
}

#[test]
fn numbers_promote_from_int_to_long_to_double() {
    let m = numbers();
    assert_truths(
        &m,
        &[
            ("i = l", Some(true)),
            ("i = d", Some(true)),
            ("l = 3.0", Some(true)),
            ("i + half = 3.5", Some(true)),
            ("l * half = 1.5", Some(true)),
            ("i / 2 = 1", Some(true)),
            ("i / 2.0 = 1.5", Some(true)),
            ("d > i - 1", Some(true)),
        ],
    );
}

#[test]
fn large_longs_compare_exactly_with_doubles() {
    // 2^53 + 1 is not representable as a double: promoting it would round it to 2^53.
    let m = message(&[("big", P::Long((1 << 53) + 1)), ("max", P::Long(i64::MAX))]);
    assert_truths(
        &m,
        &[
            ("big = 9007199254740992.0", Some(false)),
            ("big > 9007199254740992.0", Some(true)),
            ("max < 9.3E18", Some(true)),
            ("max > -9.3E18", Some(true)),
            ("2 > 1.5", Some(true)),
            ("-2 < -1.5", Some(true)),
            ("-2 > -2.5", Some(true)),
        ],
    );
}

#[test]
fn numeric_literals_take_every_form() {
    let m = message(&[("n", P::Long(7000))]);
    assert_truths(
        &m,
        &[
            ("n = 7E3", Some(true)),
            ("n = 7e+3", Some(true)),
            ("n = 70000e-1", Some(true)),
            ("n / 1000 = 7.", Some(true)),
            ("0.5 = .5", Some(true)),
            ("-57.9E2 = -5790", Some(true)),
            ("0x1F = 31", Some(true)),
            ("0XfF = 255", Some(true)),
            ("-9223372036854775808 < 0", Some(true)),
            ("9223372036854775807 > 0", Some(true)),
            ("+62 = 62", Some(true)),
        ],
    );
}

#[test]
fn string_property_is_never_converted_to_a_number() {
    let m = numbers();
    assert_truths(
        &m,
        &[
            ("s = 3", None),
            ("s + 1 = 4", None),
            ("s = '3'", Some(true)),
            ("-s = -3", None),
        ],
    );
}

#[test]
fn comparing_mismatched_types_is_unknown() {
    let m = numbers();
    assert_truths(
        &m,
        &[
            ("i = s", None),
            ("i = flag", None),
            ("flag = s", None),
            ("flag = 1", None),
            ("s = TRUE", None),
            ("flag + 1 = 2", None),
        ],
    );
}

#[test]
fn ordering_strings_or_booleans_is_unknown() {
    let m = message(&[
        ("a", P::String("a".into())),
        ("b", P::String("b".into())),
        ("t", P::Bool(true)),
        ("f", P::Bool(false)),
    ]);
    assert_truths(
        &m,
        &[
            ("a < b", None),
            ("a >= b", None),
            ("f < t", None),
            ("a = b", Some(false)),
        ],
    );
}

#[test]
fn integer_overflow_is_null_not_a_panic() {
    let m = message(&[("max", P::Long(i64::MAX)), ("min", P::Long(i64::MIN))]);
    assert_truths(
        &m,
        &[
            ("max + 1 > 0", None),
            ("max * 2 > 0", None),
            ("min - 1 < 0", None),
            ("-min > 0", None),
            ("min / -1 > 0", None),
            ("max + 0.5 > 0", Some(true)),
            ("max - 1 < max", Some(true)),
        ],
    );
}

#[test]
fn division_by_zero_is_null_not_a_panic() {
    let m = message(&[("n", P::Int(3)), ("zero", P::Int(0)), ("d", P::Double(1.5))]);
    assert_truths(
        &m,
        &[
            ("n / 0 = 0", None),
            ("n / zero = 0", None),
            ("d / 0 = 0", None),
            ("n / 0.0 = 0", None),
            ("d / -0.0 = 0", None),
            ("n / 0 = 0 OR TRUE", Some(true)),
        ],
    );
}

#[test]
fn nan_and_infinity_properties_compare_like_ieee() {
    let m = message(&[
        ("nan", P::Double(f64::NAN)),
        ("inf", P::Double(f64::INFINITY)),
    ]);
    assert_truths(
        &m,
        &[
            ("nan = nan", None),
            ("nan <> 1", None),
            ("nan < 1", None),
            ("inf > 9223372036854775807", Some(true)),
            ("-inf < -9223372036854775808", Some(true)),
            ("inf - inf = 0", None),
            ("inf = inf", Some(true)),
        ],
    );
}

#[test]
fn header_identifiers_read_the_message_headers() {
    let mut m = message(&[]);
    m.correlation_id = Some("req-1".into());
    m.jms_type = Some("order".into());
    m.group_id = Some("g7".into());
    m.priority = Priority::new(7).unwrap();
    m.persistent = false;
    let s = |text: &str, count: u32| selector(text).matches(&m, count);
    assert!(s("JMSDeliveryMode = 'NON_PERSISTENT'", 1));
    assert!(s("JMSPriority = 7 AND JMSPriority BETWEEN 5 AND 9", 1));
    assert!(s(&format!("JMSMessageID = '{}'", m.id), 1));
    assert!(s("JMSMessageID LIKE 'ID:%-42'", 1));
    assert!(s("JMSTimestamp = 1700000000000", 1));
    assert!(s("JMSTimestamp > 1.6E12", 1));
    assert!(s("JMSCorrelationID = 'req-1'", 1));
    assert!(s("JMSType = 'order'", 1));
    assert!(s("JMSXGroupID IN ('g7')", 1));
    assert!(!s("JMSXDeliveryCount > 1", 1));
    assert!(s("JMSXDeliveryCount > 1", 2));
    assert!(s("JMSXDeliveryCount = 4294967295", u32::MAX));
    m.persistent = true;
    assert!(selector("JMSDeliveryMode = 'PERSISTENT'").matches(&m, 1));
}

#[test]
fn absent_optional_headers_are_null() {
    let m = message(&[]);
    assert_truths(
        &m,
        &[
            ("JMSCorrelationID = 'x'", None),
            ("JMSType IS NULL", Some(true)),
            ("JMSXGroupID LIKE '%'", None),
            ("JMSType NOT IN ('a')", None),
        ],
    );
}

#[test]
fn timestamp_beyond_a_long_is_null() {
    let mut m = message(&[]);
    m.timestamp_ms = u64::MAX;
    assert_eq!(truth("JMSTimestamp > 0", &m), None);
}

#[test]
fn keywords_are_case_insensitive_and_identifiers_case_sensitive() {
    let m = message(&[("x", P::Int(2)), ("Color", P::String("red".into()))]);
    assert_truths(
        &m,
        &[
            ("x between 1 and 3 AnD Color like 'r%'", Some(true)),
            ("x Not In ('a') or true", Some(true)),
            ("Color is not null", Some(true)),
            ("color IS NULL", Some(true)),
            ("X IS NULL", Some(true)),
            ("tRuE", Some(true)),
        ],
    );
}

#[test]
fn identifiers_follow_java_rules() {
    let m = message(&[
        ("$price", P::Int(1)),
        ("_a1", P::Int(2)),
        ("größe", P::Int(3)),
        ("nullable", P::Int(4)),
        ("ORDER_ID", P::Int(5)),
    ]);
    assert!(is_match(
        "$price = 1 AND _a1 = 2 AND größe = 3 AND nullable = 4 AND ORDER_ID = 5",
        &m
    ));
}

#[test]
fn string_literals_escape_quotes_by_doubling_them() {
    let m = message(&[
        ("s", P::String("it's".into())),
        ("e", P::String(String::new())),
    ]);
    assert_truths(
        &m,
        &[
            ("s = 'it''s'", Some(true)),
            ("s = 'its'", Some(false)),
            ("e = ''", Some(true)),
            ("'''' = ''''", Some(true)),
        ],
    );
}

#[test]
fn boolean_property_is_a_condition_and_other_types_are_unknown() {
    let m = numbers();
    assert_truths(
        &m,
        &[
            ("flag", Some(true)),
            ("NOT flag", Some(false)),
            ("flag AND i = 3", Some(true)),
            ("i", None),
            ("s", None),
            ("missing", None),
            ("(i = 3) = flag", Some(true)),
        ],
    );
}

#[test]
fn whitespace_of_any_kind_separates_tokens() {
    let m = message(&[("x", P::Int(1))]);
    assert!(is_match("\tx\n=\r\n1\u{00A0}", &m));
    assert!(is_match("x=1 AND(x<>2)", &m));
    assert!(is_match("(x=1)AND(x<>2)", &m));
}

#[test]
fn text_returns_the_selector_as_written() {
    let text = "  color = 'red'  ";
    assert_eq!(selector(text).text(), text);
}

#[test]
fn correlation_id_equals_finds_the_literal_only_when_it_constrains_every_match() {
    let found = |text: &str| selector(text).correlation_id_equals().map(str::to_owned);
    assert_eq!(found("JMSCorrelationID = 'req-1'"), Some("req-1".into()));
    assert_eq!(found("'req-1' = JMSCorrelationID"), Some("req-1".into()));
    assert_eq!(
        found("x > 1 AND (JMSCorrelationID = 'a''b' AND y = 2)"),
        Some("a'b".into())
    );
    assert_eq!(found("JMSCorrelationID = 'a' OR x = 1"), None);
    assert_eq!(found("JMSCorrelationID <> 'a'"), None);
    assert_eq!(found("NOT JMSCorrelationID = 'a'"), None);
    assert_eq!(found("JMSType = 'a'"), None);
}

#[test]
fn long_or_chains_are_flat_not_deep() {
    let text = (0..300)
        .map(|i| format!("x = {i}"))
        .collect::<Vec<_>>()
        .join(" OR ");
    let m = message(&[("x", P::Int(299))]);
    assert!(is_match(&text, &m));
    assert!(!is_match(&text, &message(&[("x", P::Int(300))])));
}

#[test]
fn matching_does_not_depend_on_delivery_count_unless_the_selector_reads_it() {
    let s = selector("x = 1");
    let m = message(&[("x", P::Int(1))]);
    assert!(s.matches(&m, 0) && s.matches(&m, 1) && s.matches(&m, u32::MAX));
}
