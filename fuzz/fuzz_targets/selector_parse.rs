//! Any bytes, read as UTF-8 (lossily), parsed as a selector with the default limits. Parsing must
//! never panic; a selector that parses is evaluated against a fixed message and must obey the
//! laws in `ferry_fuzz::check_laws`. The text is also parsed under tight limits: whatever parses
//! under them must parse under the default ones too (limits only ever refuse).

#![no_main]

use std::collections::BTreeMap;

use ferry_fuzz::{check_laws, message};
use ferry_kernel::{Message, Priority, PropertyValue as P, Selector, SelectorLimits};
use libfuzzer_sys::fuzz_target;

const TIGHT: SelectorLimits = SelectorLimits {
    length_chars_max: 64,
    depth_max: 4,
    nodes_max: 12,
    in_list_max: 3,
    like_pattern_chars_max: 8,
};

/// A message with a property of every type under names the seeds and the fuzzer's dictionary of
/// the text it has seen are likely to use, plus a NaN and a string that looks like a number.
fn fixed_message() -> Message {
    let properties: BTreeMap<String, P> = [
        ("color", P::String("red".into())),
        ("country", P::String("UK".into())),
        ("name", P::String("a_b%c".into())),
        ("amount", P::Int(250)),
        ("count", P::Long(i64::MAX)),
        ("ratio", P::Double(0.5)),
        ("nan", P::Double(f64::NAN)),
        ("vip", P::Bool(true)),
        ("s", P::String("3".into())),
        ("empty", P::String(String::new())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut m = message(properties);
    m.correlation_id = Some("order-42".into());
    m.jms_type = Some("invoice".into());
    m.group_id = Some("g1".into());
    m.priority = Priority::new(7).expect("7 is a priority");
    m
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let limits = SelectorLimits::default();
    let parsed = Selector::parse(&text, &limits);
    if Selector::parse(&text, &TIGHT).is_ok() {
        assert!(
            parsed.is_ok(),
            "{text:?} parses under tight limits but not the default ones: {parsed:?}"
        );
    }
    let Ok(selector) = parsed else { return };
    assert_eq!(selector.text(), text, "the selector does not keep its text");
    let m = fixed_message();
    for delivery_count in [1, 2, u32::MAX] {
        check_laws(&selector, &limits, &m, delivery_count);
    }
});
