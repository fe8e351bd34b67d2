//! Behaviour of the predicates: BETWEEN, IN, LIKE and IS NULL, with NULL operands.

use super::tests::{assert_truths, message};
use crate::types::PropertyValue as P;

#[test]
fn between_is_inclusive_and_not_between_negates_it() {
    let m = message(&[("n", P::Int(5)), ("d", P::Double(2.5))]);
    assert_truths(
        &m,
        &[
            ("n BETWEEN 5 AND 7", Some(true)),
            ("n BETWEEN 1 AND 5", Some(true)),
            ("n BETWEEN 6 AND 9", Some(false)),
            ("n BETWEEN 7 AND 5", Some(false)),
            ("n NOT BETWEEN 6 AND 9", Some(true)),
            ("n NOT BETWEEN 1 AND 9", Some(false)),
            ("d BETWEEN 2 AND 3", Some(true)),
            ("n BETWEEN d * 2 AND d * 2", Some(true)),
            ("n + 1 BETWEEN 6 AND 6", Some(true)),
        ],
    );
}

#[test]
fn between_on_null_is_unknown_unless_a_bound_already_fails() {
    let m = message(&[("n", P::Int(5)), ("s", P::String("5".into()))]);
    assert_truths(
        &m,
        &[
            ("missing BETWEEN 1 AND 9", None),
            ("missing NOT BETWEEN 1 AND 9", None),
            ("n BETWEEN missing AND 9", None),
            // n <= 3 is FALSE, and FALSE AND UNKNOWN is FALSE.
            ("n BETWEEN missing AND 3", Some(false)),
            ("s BETWEEN 1 AND 9", None),
        ],
    );
}

#[test]
fn in_matches_listed_strings_and_not_in_the_rest() {
    let m = message(&[("country", P::String("UK".into())), ("n", P::Int(1))]);
    assert_truths(
        &m,
        &[
            ("country IN ('UK', 'FR')", Some(true)),
            ("country IN ('FR')", Some(false)),
            ("country IN ('uk')", Some(false)),
            ("country NOT IN ('FR', 'DE')", Some(true)),
            ("country NOT IN ('UK')", Some(false)),
            ("missing IN ('UK')", None),
            ("missing NOT IN ('UK')", None),
            ("n IN ('1')", None),
            ("JMSDeliveryMode IN ('PERSISTENT')", Some(true)),
        ],
    );
}

#[test]
fn like_matches_percent_and_underscore_wildcards() {
    let m = message(&[
        ("s", P::String("phone".into())),
        ("e", P::String(String::new())),
    ]);
    assert_truths(
        &m,
        &[
            ("s LIKE 'phone'", Some(true)),
            ("s LIKE 'phon'", Some(false)),
            ("s LIKE 'ph%'", Some(true)),
            ("s LIKE '%one'", Some(true)),
            ("s LIKE '%hon%'", Some(true)),
            ("s LIKE 'p%o%e'", Some(true)),
            ("s LIKE 'p%x%e'", Some(false)),
            ("s LIKE 'ph_ne'", Some(true)),
            ("s LIKE 'ph_'", Some(false)),
            ("s LIKE '_____'", Some(true)),
            ("s LIKE '______'", Some(false)),
            ("s LIKE '%'", Some(true)),
            ("s LIKE '%%'", Some(true)),
            ("s LIKE '%_n_%'", Some(true)),
            ("s LIKE 'phone%'", Some(true)),
            ("s LIKE 'Phone'", Some(false)),
            ("s NOT LIKE 'ph%'", Some(false)),
            ("s NOT LIKE 'x%'", Some(true)),
            ("e LIKE '%'", Some(true)),
            ("e LIKE ''", Some(true)),
            ("e LIKE '_'", Some(false)),
        ],
    );
}

#[test]
fn like_prefix_and_suffix_do_not_overlap() {
    let m = message(&[("s", P::String("aba".into()))]);
    assert_truths(
        &m,
        &[
            ("s LIKE 'ab%ba'", Some(false)),
            ("s LIKE 'ab%a'", Some(true)),
            ("s LIKE 'a%a%a'", Some(false)),
            ("s LIKE '%b%'", Some(true)),
        ],
    );
}

#[test]
fn like_escape_makes_the_next_character_literal() {
    let m = message(&[
        ("s", P::String("100%_off".into())),
        ("t", P::String("100x_off".into())),
        ("bs", P::String("a\\b".into())),
    ]);
    assert_truths(
        &m,
        &[
            ("s LIKE '100!%!_off' ESCAPE '!'", Some(true)),
            ("t LIKE '100!%!_off' ESCAPE '!'", Some(false)),
            ("t LIKE '100%_off'", Some(true)),
            ("s LIKE '%!%%' ESCAPE '!'", Some(true)),
            ("t LIKE '%!%%' ESCAPE '!'", Some(false)),
            ("bs LIKE 'a\\\\b' ESCAPE '\\'", Some(true)),
            ("bs LIKE 'a\\b'", Some(true)),
            ("s LIKE '100%%_off' ESCAPE '%'", Some(true)),
            ("t LIKE '100%%_off' ESCAPE '%'", Some(false)),
        ],
    );
}

#[test]
fn like_counts_unicode_characters_not_bytes() {
    let m = message(&[("s", P::String("naïve 日本".into()))]);
    assert_truths(
        &m,
        &[
            ("s LIKE 'na_ve __'", Some(true)),
            ("s LIKE '%日_'", Some(true)),
            ("s LIKE '%本'", Some(true)),
            ("s LIKE 'na__ve%'", Some(false)),
            ("s LIKE '________'", Some(true)),
        ],
    );
}

#[test]
fn like_on_null_or_a_non_string_is_unknown() {
    let m = message(&[("n", P::Int(5))]);
    assert_truths(
        &m,
        &[
            ("missing LIKE '%'", None),
            ("missing NOT LIKE '%'", None),
            ("n LIKE '5'", None),
        ],
    );
}

#[test]
fn is_null_tests_presence_and_is_never_unknown() {
    let m = message(&[("n", P::Int(5))]);
    assert_truths(
        &m,
        &[
            ("missing IS NULL", Some(true)),
            ("missing IS NOT NULL", Some(false)),
            ("n IS NULL", Some(false)),
            ("n is not null", Some(true)),
            ("JMSCorrelationID IS NULL", Some(true)),
        ],
    );
}
