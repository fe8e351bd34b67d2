//! Property tests: LIKE against a naive reference matcher, no panics on any input, and the NOT
//! law on selectors that cannot produce NULL.

use proptest::prelude::*;
use proptest::sample::select;

use super::tests::message;
use super::*;
use crate::types::{Priority, PropertyValue as P};

/// The definition of LIKE, by brute force: try every split at every `%`.
fn reference_like(pattern: &[char], text: &[char], escape: Option<char>) -> bool {
    match pattern {
        [] => text.is_empty(),
        [e, c, rest @ ..] if Some(*e) == escape => {
            text.first() == Some(c) && reference_like(rest, &text[1..], escape)
        }
        ['%', rest @ ..] => (0..=text.len()).any(|i| reference_like(rest, &text[i..], escape)),
        ['_', rest @ ..] => !text.is_empty() && reference_like(rest, &text[1..], escape),
        [c, rest @ ..] => text.first() == Some(c) && reference_like(rest, &text[1..], escape),
    }
}

/// Whether the pattern's last escape character has nothing after it.
fn ends_in_escape(pattern: &[char], escape: char) -> bool {
    let mut chars = pattern.iter();
    while let Some(&c) = chars.next() {
        if c == escape && chars.next().is_none() {
            return true;
        }
    }
    false
}

fn chars_of(alphabet: &'static [char], len_max: usize) -> impl Strategy<Value = Vec<char>> {
    proptest::collection::vec(select(alphabet), 0..=len_max)
}

fn like_matches(pattern: &[char], text: &[char], escape: Option<char>) -> Option<bool> {
    let pattern: String = pattern.iter().collect();
    let escape = escape.map_or(String::new(), |e| format!(" ESCAPE '{e}'"));
    let s = Selector::parse(
        &format!("s LIKE '{pattern}'{escape}"),
        &SelectorLimits::default(),
    )
    .ok()?;
    let m = message(&[("s", P::String(text.iter().collect()))]);
    Some(s.matches(&m, 1))
}

/// Any property value, NaN and infinities included.
fn property_value() -> impl Strategy<Value = P> {
    prop_oneof![
        any::<bool>().prop_map(P::Bool),
        any::<i32>().prop_map(P::Int),
        any::<i64>().prop_map(P::Long),
        select(vec![i64::MIN, i64::MAX, 0, -1]).prop_map(P::Long),
        any::<f64>().prop_map(P::Double),
        "[ab%_!'x]{0,6}".prop_map(P::String),
        any::<String>().prop_map(P::String),
    ]
}

/// Property names the generators use.
const NAMES: [&str; 7] = ["a", "b", "c", "x", "y", "s", "f"];

/// A message with arbitrary values (or nothing) for each of [`NAMES`] and arbitrary headers, and
/// a delivery count.
fn arbitrary_message() -> impl Strategy<Value = (Message, u32)> {
    let properties = proptest::collection::vec(proptest::option::of(property_value()), NAMES.len());
    let headers = (
        proptest::option::of("[a-z]{0,4}"),
        proptest::option::of("[a-z]{0,4}"),
        proptest::option::of("[a-z]{0,4}"),
        0u32..=9,
        any::<u64>(),
        any::<bool>(),
    );
    (properties, headers, any::<u32>()).prop_map(
        |(
            values,
            (correlation_id, jms_type, group_id, priority, timestamp_ms, persistent),
            count,
        )| {
            let named: Vec<(&str, P)> = NAMES
                .into_iter()
                .zip(values)
                .filter_map(|(name, v)| v.map(|v| (name, v)))
                .collect();
            let mut m = message(&named);
            m.correlation_id = correlation_id;
            m.jms_type = jms_type;
            m.group_id = group_id;
            m.priority = Priority::new(priority).unwrap_or_default();
            m.timestamp_ms = timestamp_ms;
            m.persistent = persistent;
            (m, count)
        },
    )
}

/// Tokens that make a random sequence likely to parse some of the time.
const TOKENS: &[&str] = &[
    "a",
    "b",
    "c",
    "JMSPriority",
    "JMSTimestamp",
    "JMSCorrelationID",
    "JMSXDeliveryCount",
    "JMSType",
    "JMSDeliveryMode",
    "'x'",
    "'%a_'",
    "''",
    "1",
    "0",
    "-1",
    "2.5",
    "1E308",
    ".5",
    "9223372036854775807",
    "9223372036854775808",
    "0x7FFFFFFFFFFFFFFF",
    "(",
    ")",
    "AND",
    "OR",
    "NOT",
    "=",
    "<>",
    "<",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "BETWEEN",
    "IN",
    "LIKE",
    "ESCAPE",
    "'!'",
    "IS",
    "NULL",
    ",",
    "TRUE",
    "FALSE",
];

fn token_soup() -> impl Strategy<Value = String> {
    proptest::collection::vec(select(TOKENS), 0..30).prop_map(|t| t.join(" "))
}

/// Numeric expressions over x, y and headers that can never be NULL: small values, no division
/// except by 2, no overflow.
fn number_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        select(vec!["x", "y", "JMSPriority", "JMSXDeliveryCount"]).prop_map(str::to_owned),
        (-5i32..5).prop_map(|v| v.to_string()),
        (-50i32..50).prop_map(|v| format!("{:?}", f64::from(v) / 10.0)),
    ];
    leaf.prop_recursive(3, 16, 2, |inner| {
        prop_oneof![
            (inner.clone(), select(vec!["+", "-", "*"]), inner.clone())
                .prop_map(|(a, op, b)| format!("({a} {op} {b})")),
            inner.clone().prop_map(|a| format!("-{a}")),
            inner.prop_map(|a| format!("({a}) / 2")),
        ]
    })
}

/// Conditions that are always TRUE or FALSE on messages from [`no_null_message`].
fn condition() -> impl Strategy<Value = String> {
    let not = |negated: bool| if negated { "NOT " } else { "" };
    let cmp = select(vec!["=", "<>", "<", "<=", ">", ">="]);
    let leaf = prop_oneof![
        (number_expr(), cmp, number_expr()).prop_map(|(a, op, b)| format!("{a} {op} {b}")),
        (number_expr(), any::<bool>(), number_expr(), number_expr()).prop_map(
            move |(v, negated, low, high)| format!("{v} {}BETWEEN {low} AND {high}", not(negated))
        ),
        (
            any::<bool>(),
            proptest::sample::subsequence(vec!["a", "b", "ab", ""], 1..4)
        )
            .prop_map(move |(negated, items)| {
                let list: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
                format!("s {}IN ({})", not(negated), list.join(", "))
            }),
        (any::<bool>(), "[ab%_]{0,4}")
            .prop_map(move |(negated, p)| format!("s {}LIKE '{p}'", not(negated))),
        (select(vec!["x", "s", "missing", "JMSType"]), any::<bool>())
            .prop_map(move |(name, negated)| format!("{name} IS {}NULL", not(negated))),
        select(vec![
            "f",
            "TRUE",
            "FALSE",
            "f = TRUE",
            "s = 'a'",
            "s <> 'ab'"
        ])
        .prop_map(str::to_owned),
    ];
    leaf.prop_recursive(4, 32, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) AND ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) OR {b}")),
            inner.prop_map(|a| format!("NOT {a}")),
        ]
    })
}

fn number_value() -> impl Strategy<Value = P> {
    prop_oneof![
        (-5i32..5).prop_map(P::Int),
        (-5i64..5).prop_map(P::Long),
        (-50i32..50).prop_map(|v| P::Double(f64::from(v) / 10.0)),
    ]
}

/// A message where every property the [`condition`] generator names, except `missing`, is set.
fn no_null_message() -> impl Strategy<Value = (Message, u32)> {
    (
        number_value(),
        number_value(),
        select(vec!["a", "b", "ab", "ba", ""]),
        any::<bool>(),
        0u32..=9,
        0u32..10,
    )
        .prop_map(|(x, y, s, f, priority, count)| {
            let mut m = message(&[
                ("x", x),
                ("y", y),
                ("s", P::String(s.to_owned())),
                ("f", P::Bool(f)),
            ]);
            m.priority = Priority::new(priority).unwrap_or_default();
            (m, count)
        })
}

proptest! {
    #[test]
    fn like_agrees_with_the_reference_matcher(
        pattern in chars_of(&['a', 'b', '%', '_'], 8),
        text in chars_of(&['a', 'b'], 10),
    ) {
        prop_assert_eq!(
            like_matches(&pattern, &text, None),
            Some(reference_like(&pattern, &text, None))
        );
    }

    #[test]
    fn like_with_escape_agrees_with_the_reference_matcher(
        pattern in chars_of(&['a', '%', '_', '!'], 8),
        text in chars_of(&['a', '%', '_', '!'], 8),
    ) {
        let got = like_matches(&pattern, &text, Some('!'));
        if ends_in_escape(&pattern, '!') {
            prop_assert_eq!(got, None);
        } else {
            prop_assert_eq!(got, Some(reference_like(&pattern, &text, Some('!'))));
        }
    }

    #[test]
    fn parse_never_panics_on_any_text(text in any::<String>()) {
        let _ = Selector::parse(&text, &SelectorLimits::default());
    }

    #[test]
    fn parse_and_match_never_panic_on_token_soup(
        text in token_soup(),
        (m, count) in arbitrary_message(),
    ) {
        if let Ok(s) = Selector::parse(&text, &SelectorLimits::default()) {
            let _ = s.matches(&m, count);
        }
    }

    #[test]
    fn match_never_panics_on_arbitrary_values(
        text in condition(),
        (m, count) in arbitrary_message(),
    ) {
        let s = Selector::parse(&text, &SelectorLimits::default());
        prop_assert!(s.is_ok(), "{:?}: {:?}", text, s);
        if let Ok(s) = s {
            let _ = s.matches(&m, count);
        }
    }

    #[test]
    fn not_inverts_every_selector_without_nulls(
        text in condition(),
        (m, count) in no_null_message(),
    ) {
        let limits = SelectorLimits::default();
        let s = Selector::parse(&text, &limits);
        prop_assert!(s.is_ok(), "{:?}: {:?}", text, s);
        let negated = Selector::parse(&format!("NOT ({text})"), &limits);
        prop_assert!(negated.is_ok(), "{:?}: {:?}", text, negated);
        if let (Ok(s), Ok(negated)) = (s, negated) {
            prop_assert_eq!(negated.matches(&m, count), !s.matches(&m, count), "{}", text);
        }
    }
}
