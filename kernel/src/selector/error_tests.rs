//! Selectors that must be refused: where the error points and what it says, and every limit.

use super::tests::{is_match, message};
use super::*;
use crate::types::PropertyValue as P;

/// The position and reason of the error `text` must produce under `limits`.
fn error_with(text: &str, limits: &SelectorLimits) -> (usize, String) {
    match Selector::parse(text, limits) {
        Ok(s) => panic!("{text:?} should be refused, parsed as {s:?}"),
        Err(KernelError::InvalidSelector { position, reason }) => (position, reason),
        Err(other) => panic!("{text:?}: expected InvalidSelector, got {other:?}"),
    }
}

fn error(text: &str) -> (usize, String) {
    error_with(text, &SelectorLimits::default())
}

/// Each case: selector, 1-based position of the problem, words the reason must contain.
fn assert_errors(cases: &[(&str, usize, &str)]) {
    for &(text, position, needle) in cases {
        let (p, reason) = error(text);
        assert_eq!(p, position, "position for {text:?} ({reason})");
        assert!(
            reason.contains(needle),
            "reason for {text:?} should mention {needle:?}: {reason}"
        );
    }
}

#[test]
fn error_message_names_position_and_what_was_expected() {
    let err = Selector::parse("a =", &SelectorLimits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "selector is invalid at position 4: expected a value after '=', found end of selector"
    );
}

#[test]
fn lexical_errors_point_at_the_offending_character() {
    assert_errors(&[
        ("color = 'red", 9, "not terminated"),
        // Positions count characters, not bytes.
        ("größe = 'x", 9, "not terminated"),
        ("a = 1 # 2", 7, "unexpected character '#'"),
        ("a != 1", 3, "write '<>'"),
        ("a = \"x\"", 5, "single quotes"),
        ("a = 12abc", 7, "right after the number at position 5"),
        ("a = 1.5.3", 8, "right after the number"),
        ("a = 1e", 6, "exponent needs digits"),
        ("0x = 1", 1, "digits after 0x"),
        ("a = 0x10000000000000000", 5, "too large"),
        ("a = 99999999999999999999", 5, "too large"),
        ("a = 1E400", 5, "outside the range of a double"),
    ]);
}

#[test]
fn syntax_errors_point_at_the_unexpected_token() {
    assert_errors(&[
        (
            "a =",
            4,
            "expected a value after '=', found end of selector",
        ),
        ("NOT", 4, "expected a value after NOT"),
        (
            "= 1",
            1,
            "expected a value at the start of the selector, found '='",
        ),
        ("a = 1 AND", 10, "expected a value after AND"),
        (
            "a = 1 b = 2",
            7,
            "expected AND, OR or the end of the selector",
        ),
        ("(a = 1", 7, "expected ')' to close the '(' at position 1"),
        ("a = 1)", 6, "')' has no matching '('"),
        ("a = 1 = 2", 7, "comparisons do not chain"),
        ("a < b BETWEEN 1 AND 2", 7, "comparisons do not chain"),
        ("x BETWEEN 1 5", 13, "expected AND in BETWEEN"),
        ("a IS 5", 6, "expected NULL after IS"),
        ("a IS NOT 1", 10, "expected NULL after NOT"),
        ("a = NULL", 5, "IS NULL"),
        ("", 1, "selector is empty"),
        ("   ", 1, "selector is empty"),
    ]);
}

#[test]
fn in_like_and_escape_errors_point_at_the_bad_part() {
    assert_errors(&[
        ("a IN ()", 7, "the IN list is empty"),
        ("a IN (1, 2)", 7, "only string literals, found number 1"),
        ("a IN ('x', 2)", 12, "only string literals"),
        ("a IN ('x' 'y')", 11, "expected ',' or ')'"),
        (
            "a IN ('x'",
            10,
            "expected ',' or ')' in the IN list, found end of selector",
        ),
        ("a IN 'x'", 6, "expected '(' after IN"),
        ("5 IN ('a')", 1, "IN tests a property or header name"),
        ("a LIKE b", 8, "pattern in single quotes"),
        (
            "a LIKE 'x' ESCAPE 'ab'",
            19,
            "exactly one character, found 2",
        ),
        ("a LIKE 'x' ESCAPE ''", 19, "exactly one character, found 0"),
        ("a LIKE 'x' ESCAPE 1", 19, "one character in single quotes"),
        (
            "a LIKE 'x!' ESCAPE '!'",
            8,
            "ends with the escape character '!'",
        ),
        ("JMSPriority LIKE 'a'", 1, "this header is a number"),
        (
            "a + 1 IS NULL",
            1,
            "IS NULL tests a property or header name",
        ),
    ]);
}

#[test]
fn type_errors_known_from_the_text_are_refused() {
    assert_errors(&[
        (
            "JMSPriority = 'high'",
            15,
            "a number on the left of '=' cannot be compared with a string",
        ),
        ("'a' < 'b'", 1, "'<' compares numbers, but this is a string"),
        ("TRUE > FALSE", 1, "compares numbers"),
        ("x > 'b'", 5, "compares numbers"),
        ("1 = TRUE", 5, "cannot be compared"),
        (
            "'a' + 1 = 2",
            1,
            "arithmetic (at position 5) needs numbers, but this is a string",
        ),
        ("-'a' = 1", 2, "needs numbers"),
        ("x BETWEEN 'a' AND 'b'", 11, "BETWEEN compares numbers"),
        (
            "1 + 2",
            1,
            "a selector must be a condition, but this is a number",
        ),
        ("'a'", 1, "must be a condition"),
        ("a AND 5", 7, "each side of AND must be a condition"),
        ("NOT 'x'", 5, "NOT's operand must be a condition"),
        ("a = 9223372036854775808", 5, "outside the range of a long"),
        (
            "- -9223372036854775808 = 1",
            1,
            "outside the range of a long",
        ),
    ]);
}

#[test]
fn reserved_jms_names_are_refused_with_the_supported_headers_listed() {
    let (position, reason) = error("x = 1 AND JMSRedelivered = TRUE");
    assert_eq!(position, 11);
    for name in [
        "JMSRedelivered",
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSMessageID",
        "JMSTimestamp",
        "JMSCorrelationID",
        "JMSType",
        "JMSXDeliveryCount",
        "JMSXGroupID",
    ] {
        assert!(reason.contains(name), "{reason}");
    }
    // Header names are case-sensitive like every identifier.
    assert_eq!(error("JMSpriority = 1").0, 1);
}

#[test]
fn limit_on_length_counts_characters() {
    let limits = SelectorLimits::default();
    let fill = |n: usize| format!("s = '{}'", "é".repeat(n - 6));
    assert!(Selector::parse(&fill(4096), &limits).is_ok());
    let (position, reason) = error(&fill(4097));
    assert_eq!(position, 4097);
    assert!(reason.contains("selector is 4097 characters, the limit is 4096 (length_chars_max)"));
}

#[test]
fn limit_on_depth_counts_parentheses() {
    let nested = |n: usize| format!("{}TRUE{}", "(".repeat(n), ")".repeat(n));
    assert!(Selector::parse(&nested(64), &SelectorLimits::default()).is_ok());
    let (position, reason) = error(&nested(65));
    assert_eq!(position, 65);
    assert!(
        reason.contains("more than 64 levels deep (depth_max)"),
        "{reason}"
    );
}

#[test]
fn limit_on_depth_counts_not_signs_and_arithmetic_chains() {
    let (_, reason) = error(&format!("{}TRUE", "NOT ".repeat(70)));
    assert!(reason.contains("depth_max"));
    let (_, reason) = error(&format!("{}x = 1", "- ".repeat(70)));
    assert!(reason.contains("depth_max"));
    let (_, reason) = error(&format!("x{} = 1", " + x".repeat(70)));
    assert!(reason.contains("depth_max"));
    let shallow = SelectorLimits {
        depth_max: 3,
        ..SelectorLimits::default()
    };
    assert!(Selector::parse("x + 1 = 2", &shallow).is_ok());
    assert_eq!(error_with("x + 1 + 1 = 3", &shallow).0, 11);
}

#[test]
fn deep_nesting_is_refused_before_it_can_overflow_the_stack() {
    let limits = SelectorLimits {
        length_chars_max: usize::MAX,
        ..SelectorLimits::default()
    };
    for open in ["(", "NOT ", "-", "NOT -("] {
        let text = open.repeat(100_000);
        let (_, reason) = error_with(&text, &limits);
        assert!(reason.contains("depth_max"), "{open}: {reason}");
    }
}

#[test]
fn limit_on_nodes_counts_values_names_and_operators() {
    let tiny = SelectorLimits {
        nodes_max: 5,
        ..SelectorLimits::default()
    };
    assert!(Selector::parse("a = 1", &tiny).is_ok());
    let (position, reason) = error_with("a = 1 AND b = 2", &tiny);
    assert_eq!(position, 13);
    assert!(reason.contains("more than 5 values, names and operators (nodes_max)"));

    let terms = |n: usize| vec!["a=1"; n].join(" OR ");
    assert!(Selector::parse(&terms(333), &SelectorLimits::default()).is_ok());
    assert!(error(&terms(334)).1.contains("more than 1000"));
}

#[test]
fn limit_on_in_list_counts_entries() {
    let list = |n: usize| format!("a IN ({})", vec!["'x'"; n].join(","));
    assert!(Selector::parse(&list(256), &SelectorLimits::default()).is_ok());
    let (position, reason) = error(&list(257));
    assert_eq!(position, "a IN (".len() + 256 * 4 + 1);
    assert!(reason.contains("more than 256 entries (in_list_max)"));
}

#[test]
fn limit_on_like_pattern_counts_characters() {
    let like = |n: usize| format!("a LIKE '{}'", "ü".repeat(n));
    assert!(Selector::parse(&like(256), &SelectorLimits::default()).is_ok());
    let (position, reason) = error(&like(257));
    assert_eq!(position, 8);
    assert!(reason.contains("257 characters, the limit is 256 (like_pattern_chars_max)"));
}

#[test]
fn refused_selectors_never_reach_a_message() {
    // A selector that is fine apart from one bad part is refused whole, not partly applied.
    let m = message(&[("a", P::Int(1))]);
    assert!(is_match("a = 1", &m));
    assert!(Selector::parse("a = 1 OR JMSFoo = 2", &SelectorLimits::default()).is_err());
}
